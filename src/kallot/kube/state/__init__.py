"""The live scheduler's state: what the watch showed, translated once per object version
(``kube.translate``), kept in the store with the pod state machine (``store``), the usage ledger
(``usage``), the scheduling queue (``queue``) and, on top, the cache's sessions and assume /
forget (``cache``); and the pipeline of stages that builds each session's input (``pipeline``).
Second in the flow watch -> state -> schedule -> bind."""
