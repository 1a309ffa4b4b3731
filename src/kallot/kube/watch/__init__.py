"""The live scheduler's view of the API server: reflectors (list, then watch, resync) that feed
the state (``kube.state``) with watch events and lists. First in the flow watch -> state ->
schedule -> bind; it knows nothing of what the events mean."""
