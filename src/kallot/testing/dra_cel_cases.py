"""One CEL expression per function of kube-scheduler's DRA selector environment (1.36), for
tests/dra/test_dra_cel_upstream.py and the table in docs/dra.md ("CEL functions").

Each entry: (library, function, expression). Every expression is evaluated on ``DEVICE``
(attributes and capacity of a gpu.nvidia.com GPU) by kallot and by upstream's environment
(k8s.io/dynamic-resource-allocation/cel v0.36.3, through tools/testenv/dra-diff).
"""

from __future__ import annotations

from typing import Any

A = "device.attributes['gpu.nvidia.com']"
C = "device.capacity['gpu.nvidia.com']"

DEVICE: dict[str, Any] = {
    "driver": "gpu.nvidia.com",
    "allowMultipleAllocations": True,
    "attributes": {
        "type": {"string": "gpu"},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "driverVersion": {"version": "570.124.6"},
        "index": {"int": 3},
        "healthy": {"bool": True},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:40"},
    },
    "capacity": {"memory": {"value": "80Gi"}, "multiprocessors": {"value": "132"}},
}

FUNCTIONS: list[tuple[str, str, str]] = [
    # the device variable
    ("device", "driver", "device.driver == 'gpu.nvidia.com'"),
    ("device", "attributes (string)", f"{A}.type == 'gpu'"),
    ("device", "attributes (int)", f"{A}.index == 3"),
    ("device", "attributes (bool)", f"{A}.healthy"),
    (
        "device",
        "attributes (other domain)",
        "device.attributes['resource.kubernetes.io'].pcieRoot == 'pci0000:40'",
    ),
    ("device", "attributes (unknown domain)", "device.attributes['x.example.com'].size() == 0"),
    ("device", "attributes (missing: error)", f"{A}.missing == 1"),
    ("device", "capacity", f"{C}.memory.isGreaterThan(quantity('40Gi'))"),
    ("device", "allowMultipleAllocations", "device.allowMultipleAllocations"),
    # CEL standard library
    ("standard", "== != < <= > >=", f"{A}.index >= 3 && {A}.index < 4 && {A}.type != 'mig'"),
    ("standard", "&& || ! ?:", f"!({A}.index == 2) || false ? true : false"),
    ("standard", "+ - * / %", f"({A}.index * 2 + 1 - 1) / 2 % 2 == 1"),
    ("standard", "in (map)", f"'type' in {A}"),
    ("standard", "in (list)", "3 in [1, 2, 3]"),
    ("standard", "has", f"has({A}.type)"),
    ("standard", "size", f"size({A}.productName) == 21"),
    ("standard", "size (code points)", "'\u00d7'.size() == 1 && size('\u00e9t\u00e9') == 3"),
    ("standard", "contains", f"{A}.productName.contains('H100')"),
    ("standard", "startsWith", f"{A}.productName.startsWith('NVIDIA')"),
    ("standard", "endsWith", f"{A}.productName.endsWith('HBM3')"),
    ("standard", "matches", f"{A}.productName.matches('^NVIDIA H[0-9]+')"),
    ("standard", "matches (bad constant pattern)", "'a'.matches('[')"),
    ("standard", "int", "int('7') == 7"),
    ("standard", "uint", "uint(7) == 7u"),
    ("standard", "double", "double(1) == 1.0"),
    ("standard", "string", f"string({A}.index) == '3'"),
    ("standard", "bool", "bool('true')"),
    ("standard", "bytes", "bytes('a') == b'a'"),
    ("standard", "type", "type(1) == int"),
    ("standard", "dyn", "dyn(1) == 1"),
    ("standard", "duration", "duration('1h') > duration('1m')"),
    (
        "standard",
        "timestamp",
        "timestamp('2026-01-01T00:00:00Z') < timestamp('2027-01-01T00:00:00Z')",
    ),
    ("standard", "getFullYear", "timestamp('2026-01-01T00:00:00Z').getFullYear() == 2026"),
    (
        "standard",
        "timestamp getters with a time zone",
        "timestamp('2026-01-01T00:00:00Z').getHours('America/New_York') == 19 && "
        "timestamp('2026-01-01T00:00:00Z').getFullYear('-05:00') == 2025 && "
        "timestamp('2026-01-01T00:00:00Z').getDayOfWeek('UTC') == 4 && "
        "timestamp('2026-03-01T00:00:00Z').getMonth('+01:00') == 2",
    ),
    (
        "standard",
        "timestamp getter, unknown time zone (error)",
        "timestamp('2026-01-01T00:00:00Z').getHours('Nowhere/City') == 1",
    ),
    ("standard", "all", "[1, 2].all(x, x > 0)"),
    ("standard", "exists", f"{A}.exists(k, k == 'type')"),
    ("standard", "exists_one", "[1, 2].exists_one(x, x > 1)"),
    ("standard", "map", "[1, 2].map(x, x * 2) == [2, 4]"),
    ("standard", "filter", "[1, 2, 3].filter(x, x > 1).size() == 2"),
    # cross-type numeric comparisons (1.28)
    ("standard", "cross-type comparison", "1 < 2.5 && 2u > 1"),
    # optional types (1.28)
    ("optional", ".?field.orValue", f"{A}.?missing.orValue('none') == 'none'"),
    ("optional", ".?field.hasValue", f"{A}.?type.hasValue()"),
    ("optional", ".?field.value", f"{A}.?type.value() == 'gpu'"),
    ("optional", "[?key].orValue", f"{A}[?'missing'].orValue(5) == 5"),
    (
        "optional",
        "optional.of / optional.none",
        "optional.of(1).hasValue() && !optional.none().hasValue()",
    ),
    ("optional", ".or", f"{A}.?missing.or(optional.of('x')).value() == 'x'"),
    ("optional", "optional.ofNonZeroValue", "!optional.ofNonZeroValue(0).hasValue()"),
    ("optional", ".? (as a value)", f"{A}.?type == optional.of('gpu')"),
    ("optional", "[?index] (list)", "[1, 2][?5].orValue(0) == 0 && [1, 2][?1].value() == 2"),
    ("optional", "optMap", f"{A}.?index.optMap(i, i + 1).value() == 4"),
    ("optional", "optFlatMap", f"{A}.?index.optFlatMap(i, optional.of(i * 2)).value() == 6"),
    ("optional", "first / last", "[1, 2].first().value() == 1 && [].last().hasValue() == false"),
    (
        "optional",
        "optional.unwrap / unwrapOpt",
        "optional.unwrap([optional.of(1), optional.none()]) == [1] "
        "&& [optional.of(2)].unwrapOpt() == [2]",
    ),
    ("optional", ".value() of none (error)", "optional.none().value() == 1"),
    ("optional", "[?x] list entries", "[1, ?optional.none(), ?optional.of(3)] == [1, 3]"),
    (
        "optional",
        "{?k: x} map entries",
        f"{{?'y': optional.none(), ?'z': {A}[?'type']}} == {{'z': 'gpu'}} && "
        "{'x': 'a', ?'y': optional.of('b')} == {'x': 'a', 'y': 'b'}",
    ),
    # ext.Strings v2
    ("strings", "charAt", "'abc'.charAt(1) == 'b'"),
    ("strings", "indexOf", "'abcb'.indexOf('b') == 1"),
    ("strings", "lastIndexOf", "'abcb'.lastIndexOf('b') == 3"),
    ("strings", "lowerAscii", "'ABC'.lowerAscii() == 'abc'"),
    ("strings", "upperAscii", "'abc'.upperAscii() == 'ABC'"),
    ("strings", "replace", "'aXa'.replace('X', 'b') == 'aba'"),
    ("strings", "split", "'a,b'.split(',') == ['a', 'b']"),
    ("strings", "substring", "'abcdef'.substring(1, 3) == 'bc'"),
    ("strings", "trim", "' a '.trim() == 'a'"),
    ("strings", "join", "['a', 'b'].join('-') == 'a-b'"),
    ("strings", "quote", "strings.quote('a') == '\"a\"'"),
    ("strings", "format", "'%d GPUs'.format([2]) == '2 GPUs'"),
    ("strings", "format %s", "'%s/%s'.format(['a', [1, 'b']]) == 'a/[1, \"b\"]'"),
    (
        "strings",
        "format %f %e",
        "'%.2f %e'.format([1234.5, 1.5]) == '1,234.50 1.500000\u00d710\u2070\u2070'",
    ),
    (
        "strings",
        "format %e (negative exponent)",
        "'%e'.format([0.0015]) == '1.500000\u00d710\u207b\u2070\u00b3'",
    ),
    ("strings", "format %s of doubles", "'%s %s'.format([0.5, [1.5]]) == '0.5 [1.500000]'"),
    (
        "strings",
        "format %x %X %o %b",
        "'%x %X %o %b'.format([255, 'hi', 8, 5]) == 'ff 6869 10 101'",
    ),
    (
        "strings",
        "format %% and a map",
        """'%%%s'.format([{'b': 2, 'a': 1}]) == '%{"a":1, "b":2}'""",
    ),
    ("strings", "format %d of a string (error)", "dyn('%d').format(['x']) == ''"),
    ("strings", "format too few args (error)", "dyn('%s %s').format([1]) == ''"),
    (
        "strings",
        "format %s of times",
        "'%s %s %s'.format([timestamp('2026-01-01T00:00:00.5Z'), duration('90m'), "
        "[duration('1.5s')]]) == '2026-01-01T00:00:00.5Z 5400s [duration(\"1.5s\")]'",
    ),
    (
        "strings",
        "format of infinities",
        "'%s %f %e %s'.format([1.0/0.0, -1.0/0.0, 1.0/0.0, [1234567.0]]) "
        "== '+Inf -\u221e      \u221e [1234567.000000]'",
    ),
    (
        "strings",
        "format %s of a double",
        "'%s %s'.format([1234567.0, 0.00001]) == '1.234567e+06 1e-05'",
    ),
    ("strings", "reverse (string: ext.Strings v3, not here)", "'abc'.reverse() == 'cba'"),
    # ext.Sets
    ("sets", "sets.contains", "sets.contains([1, 2, 3], [2])"),
    ("sets", "sets.equivalent", "sets.equivalent([1, 2], [2, 1])"),
    ("sets", "sets.intersects", "sets.intersects([1, 2], [2, 3])"),
    # ext.Lists v3
    ("ext lists", "slice", "[1, 2, 3].slice(1, 2) == [2]"),
    ("ext lists", "flatten", "[[1], [2]].flatten() == [1, 2]"),
    ("ext lists", "distinct", "[1, 1, 2].distinct() == [1, 2]"),
    ("ext lists", "sort", "[2, 1].sort() == [1, 2]"),
    ("ext lists", "range", "lists.range(3) == [0, 1, 2]"),
    ("ext lists", "reverse", "[1, 2].reverse() == [2, 1]"),
    ("ext lists", "sortBy", "[3, 1, 2].sortBy(x, -x) == [3, 2, 1]"),
    (
        "ext lists",
        "sortBy (map keys)",
        "[{'n': 'b'}, {'n': 'a'}].sortBy(m, m.n).map(m, m.n) == ['a', 'b']",
    ),
    # ext.TwoVarComprehensions (1.32)
    ("two-variable comprehensions", "all(i, v, ...)", "[1, 2].all(i, v, v > i)"),
    (
        "two-variable comprehensions",
        "exists(i, v, ...)",
        f"{A}.exists(k, v, k == 'index' && v == 3)",
    ),
    ("two-variable comprehensions", "existsOne", "[1, 2, 3].existsOne(i, v, i == 1 && v == 2)"),
    ("two-variable comprehensions", "exists_one(i, v, ...)", "{'a': 1}.exists_one(k, v, v == 1)"),
    ("two-variable comprehensions", "transformList", "[1, 2].transformList(i, v, v * 2) == [2, 4]"),
    (
        "two-variable comprehensions",
        "transformList (filter)",
        "[1, 2, 3].transformList(i, v, i % 2 == 0, v * 10) == [10, 30]",
    ),
    (
        "two-variable comprehensions",
        "transformMap",
        "{'a': 1, 'b': 2}.transformMap(k, v, v > 1, v * 2) == {'b': 4}",
    ),
    (
        "two-variable comprehensions",
        "transformMap (list)",
        "[5, 6].transformMap(i, v, v + i) == {0: 5, 1: 7}",
    ),
    (
        "two-variable comprehensions",
        "transformMapEntry",
        "{'a': 'x'}.transformMapEntry(k, v, {v: k}) == {'x': 'a'}",
    ),
    (
        "two-variable comprehensions",
        "transformMapEntry duplicate key (error)",
        "[1, 1].transformMapEntry(i, v, {v: i}).size() == 1",
    ),
    # ext.Bindings (DRA)
    ("bindings", "cel.bind", f"cel.bind(d, {A}, d.type == 'gpu')"),
    # Kubernetes: lists
    ("k8s lists", "isSorted", "[1, 2, 3].isSorted()"),
    ("k8s lists", "sum", "[1, 2, 3].sum() == 6"),
    ("k8s lists", "min", "[3, 1].min() == 1"),
    ("k8s lists", "max", "[3, 1].max() == 3"),
    ("k8s lists", "indexOf (list)", "[1, 2, 3].indexOf(2) == 1"),
    ("k8s lists", "lastIndexOf (list)", "[1, 2, 2].lastIndexOf(2) == 2"),
    # Kubernetes: regex
    ("k8s regex", "find", "'abc123'.find('[0-9]+') == '123'"),
    ("k8s regex", "findAll", "'a1b2'.findAll('[0-9]') == ['1', '2']"),
    # Kubernetes: URLs
    ("k8s urls", "url / getHost", "url('https://example.com:80/x').getHost() == 'example.com:80'"),
    ("k8s urls", "isURL", "isURL('https://example.com') && !isURL('example.com') && isURL('/p')"),
    (
        "k8s urls",
        "getScheme / getHostname / getPort",
        "url('https://u@example.com:8080/a').getScheme() == 'https' "
        "&& url('https://u@example.com:8080/a').getHostname() == 'example.com' "
        "&& url('https://[::1]:80/').getPort() == '80' && url('https://[::1]/').getHostname() == '::1'",
    ),
    (
        "k8s urls",
        "getEscapedPath / getQuery",
        "url('https://e.com/a%20b?x=1&x=2&y').getEscapedPath() == '/a%20b' "
        "&& url('https://e.com/?x=1&x=2&y').getQuery() == {'x': ['1', '2'], 'y': ['']}",
    ),
    ("k8s urls", "url of a bad URL (error)", "url('not a url').getHost() == ''"),
    # Kubernetes: quantity
    (
        "k8s quantity",
        "quantity / isQuantity",
        "isQuantity('1Gi') && quantity('1Gi') == quantity('1024Mi')",
    ),
    ("k8s quantity", "compareTo", f"{C}.memory.compareTo(quantity('80Gi')) == 0"),
    ("k8s quantity", "isGreaterThan / isLessThan", f"{C}.memory.isLessThan(quantity('81Gi'))"),
    (
        "k8s quantity",
        "add / sub",
        "quantity('1Gi').add(quantity('1Gi')).sub(1).isLessThan(quantity('2Gi'))",
    ),
    ("k8s quantity", "asInteger", f"{C}.multiprocessors.asInteger() == 132"),
    ("k8s quantity", "asApproximateFloat", "quantity('1.5').asApproximateFloat() == 1.5"),
    ("k8s quantity", "isInteger", "quantity('1.5').isInteger() == false"),
    ("not in the environment", "sign (on a quantity)", "quantity('-1').sign() == -1"),
    # Kubernetes: semver
    (
        "k8s semver",
        "semver / isSemver",
        f"isSemver('1.2.3') && {A}.driverVersion == semver('570.124.6')",
    ),
    ("k8s semver", "semver (normalize)", "semver('v1.2', true) == semver('1.2.0')"),
    ("k8s semver", "compareTo (version)", f"{A}.driverVersion.compareTo(semver('570.0.0')) > 0"),
    (
        "k8s semver",
        "isGreaterThan / isLessThan (version)",
        f"{A}.driverVersion.isGreaterThan(semver('550.0.0'))",
    ),
    (
        "k8s semver",
        "major / minor / patch",
        f"{A}.driverVersion.major() == 570 && {A}.driverVersion.minor() == 124 && {A}.driverVersion.patch() == 6",
    ),
    # Kubernetes: IP and CIDR (1.30)
    ("k8s ip", "ip / isIP / family", "isIP('10.0.0.1') && ip('10.0.0.1').family() == 4"),
    ("k8s ip", "isLoopback", "ip('127.0.0.1').isLoopback()"),
    ("k8s ip", "family (6)", "ip('fe80::1').family() == 6"),
    (
        "k8s ip",
        "isUnspecified / isGlobalUnicast",
        "ip('0.0.0.0').isUnspecified() && ip('10.0.0.1').isGlobalUnicast() "
        "&& !ip('255.255.255.255').isGlobalUnicast()",
    ),
    (
        "k8s ip",
        "isLinkLocalMulticast / isLinkLocalUnicast",
        "ip('224.0.0.1').isLinkLocalMulticast() && ip('ff02::1').isLinkLocalMulticast() "
        "&& ip('169.254.1.1').isLinkLocalUnicast() && ip('fe80::1').isLinkLocalUnicast()",
    ),
    ("k8s ip", "ip.isCanonical", "ip.isCanonical('::1') && !ip.isCanonical('0:0::1')"),
    (
        "k8s ip",
        "isIP (refusals)",
        "!isIP('::ffff:1.2.3.4') && !isIP('fe80::1%eth0') && !isIP('1.2.3')",
    ),
    ("k8s ip", "string(ip) and ==", "string(ip('0:0::1')) == '::1' && ip('::1') == ip('0::1')"),
    ("k8s ip", "ip of a bad address (error)", "ip('1.2.3').family() == 4"),
    ("k8s cidr", "cidr / containsIP", "cidr('10.0.0.0/8').containsIP(ip('10.1.2.3'))"),
    (
        "k8s cidr",
        "containsIP (string) / containsCIDR",
        "cidr('10.0.0.0/8').containsIP('10.1.2.3') && !cidr('10.0.0.0/8').containsIP('::1') "
        "&& cidr('10.0.0.0/8').containsCIDR('10.1.0.0/16') && !cidr('10.1.0.0/16').containsCIDR(cidr('10.0.0.0/8'))",
    ),
    (
        "k8s cidr",
        "ip / masked / string",
        "cidr('10.1.2.3/8').ip() == ip('10.1.2.3') && string(cidr('10.1.2.3/8').masked()) == '10.0.0.0/8' "
        "&& string(cidr('10.1.2.3/8')) == '10.1.2.3/8'",
    ),
    (
        "k8s cidr",
        "isCIDR (refusals)",
        "!isCIDR('10.0.0.0') && !isCIDR('10.0.0.0/33') && !isCIDR('::ffff:1.2.3.4/96')",
    ),
    ("k8s cidr", "cidr of a bad prefix (error)", "cidr('10.0.0.0/33').prefixLength() == 33"),
    (
        "k8s cidr",
        "isCIDR / prefixLength",
        "isCIDR('10.0.0.0/8') && cidr('10.0.0.0/8').prefixLength() == 8",
    ),
    # Kubernetes: format (1.31)
    (
        "k8s format",
        "format.dns1123Label",
        "format.dns1123Label().validate('gpu-0').hasValue() == false",
    ),
    (
        "k8s format",
        "format.dns1123Label (messages)",
        "format.dns1123Label().validate('a.b').value() == ['must not contain dots'] && "
        "format.dns1123Label().validate('A').value()[0].startsWith('a lowercase RFC 1123 label') && "
        "format.dns1123Label().validate('"
        + "a" * 64
        + "').value() == ['must be no more than 63 characters']",
    ),
    (
        "k8s format",
        "format.named",
        "format.named('uuid').hasValue() && !format.named('nope').hasValue() && "
        "format.named('dns1123Subdomain').value().validate('example.com') == optional.none()",
    ),
    (
        "k8s format",
        "format.dns1123Subdomain / dns1035Label",
        "format.dns1123Subdomain().validate('Example.com').value() == ["
        '"a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '
        "'-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', "
        "regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')\"] && "
        "format.dns1035Label().validate('1a').value().size() == 1",
    ),
    (
        "k8s format",
        "format.*Prefix",
        "!format.dns1123LabelPrefix().validate('gpu-').hasValue() && "
        "!format.dns1123SubdomainPrefix().validate('a.b-').hasValue() && "
        "!format.dns1035LabelPrefix().validate('gpu-').hasValue() && "
        "format.dns1123Label().validate('gpu-').hasValue()",
    ),
    (
        "k8s format",
        "format.qualifiedName / labelValue",
        "format.qualifiedName().validate('a/b/c').value().size() == 1 && "
        "format.qualifiedName().validate('/x').value() == ['prefix part must be non-empty'] && "
        "!format.qualifiedName().validate('example.com/MyName').hasValue() && "
        "format.labelValue().validate('-x').value().size() == 1 && !format.labelValue().validate('').hasValue()",
    ),
    (
        "k8s format",
        "format.uri / uuid / byte",
        "!format.uri().validate('https://e.com/x').hasValue() && format.uri().validate('x').hasValue() && "
        "!format.uuid().validate('123e4567-e89b-12d3-a456-426614174000').hasValue() && "
        "format.uuid().validate('x').value() == ['does not match the UUID format'] && "
        "!format.byte().validate('aGVsbG8=').hasValue() && format.byte().validate('a').value() == ['invalid base64']",
    ),
    (
        "k8s format",
        "format.date / datetime",
        "!format.date().validate('2021-01-01').hasValue() && format.date().validate('2021-02-30').value() == ['invalid date'] && "
        "!format.datetime().validate('2021-01-01T00:00:00Z').hasValue() && "
        "format.datetime().validate('2021-01-01T25:00:00Z').value() == ['invalid datetime']",
    ),
    # runtime cost (1,000,000 per evaluation, library calls charged as upstream charges them)
    ("runtime cost", "lists.range under the limit", "lists.range(1000).size() == 1000"),
    ("runtime cost", "lists.range over the limit (error)", "lists.range(2000000).size() > 0"),
    (
        "runtime cost",
        "sort over the limit (error)",
        "lists.range(100000).reverse().sort().size() > 0",
    ),
    # math (cel-go ext.Math is not in the base environment: both refuse)
    ("not in the environment", "math.greatest", "math.greatest(1, 2) == 2"),
    # list-type attributes (1.36, DRAListTypeAttributes: off in kube-scheduler 1.36)
    ("list-type attributes", "includes", f"{A}.type.includes('gpu')"),
]
