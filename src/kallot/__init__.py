"""kallot: GPU scheduling and allocation for Kubernetes.

One pure scheduling core (``kallot.core``) and the shells around it: the trace-driven
simulator (``kallot.sim``), the live scheduler (``kallot.kube``), the node agent
(``kallot.node``) and the command line (``kallot.cli``, the composition root).
"""

__version__ = "0.1.0"
