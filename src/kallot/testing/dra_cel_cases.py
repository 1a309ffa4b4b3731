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
    ("standard", "contains", f"{A}.productName.contains('H100')"),
    ("standard", "startsWith", f"{A}.productName.startsWith('NVIDIA')"),
    ("standard", "endsWith", f"{A}.productName.endsWith('HBM3')"),
    ("standard", "matches", f"{A}.productName.matches('^NVIDIA H[0-9]+')"),
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
    # ext.TwoVarComprehensions (1.32)
    ("two-variable comprehensions", "all(i, v, ...)", "[1, 2].all(i, v, v > i)"),
    ("two-variable comprehensions", "transformList", "[1, 2].transformList(i, v, v * 2) == [2, 4]"),
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
    ("k8s urls", "isURL", "isURL('https://example.com')"),
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
    ("k8s cidr", "cidr / containsIP", "cidr('10.0.0.0/8').containsIP(ip('10.1.2.3'))"),
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
    # math (cel-go ext.Math is not in the base environment: both refuse)
    ("not in the environment", "math.greatest", "math.greatest(1, 2) == 2"),
    # list-type attributes (1.36, DRAListTypeAttributes: off in kube-scheduler 1.36)
    ("list-type attributes", "includes", f"{A}.type.includes('gpu')"),
]
