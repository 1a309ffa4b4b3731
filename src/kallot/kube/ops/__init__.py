"""Running the live scheduler and looking into it: leadership (``leader``), metrics and the
health server (``metrics``), logging (``logs``), Events and conditions (``reporter``),
PodGroup/Queue status (``status``), session sizing (``sizing``), ``kallot explain``
(``explain``) and ``kallot doctor`` (``doctor``). Below the session loop (``kube.schedule``
reports, sizes and counts through it), above the binding cycle, DRA and owners it explains."""
