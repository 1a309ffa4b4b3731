"""The names the owners' controllers write on pods and objects, and the owner kinds' names.

Where it sits: the vocabulary of ``kube.owners`` (read by ``facts``, ``gangs``, ``kinds`` and the
index). Label and annotation keys are each controller's own; each kind's API path, RBAC and gang
rule are its entry in ``kinds.KINDS``.
"""

from __future__ import annotations

# -- what the owners' controllers put on pods ---------------------------------------------------

# kube-controller-manager's Job controller (batch/v1).
LABEL_JOB_NAME = "batch.kubernetes.io/job-name"
LABEL_JOB_CONTROLLER_UID = "batch.kubernetes.io/controller-uid"
LABEL_JOB_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
# JobSet (jobset.x-k8s.io): on its Jobs and their pods.
LABEL_JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
LABEL_JOBSET_REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
LABEL_JOBSET_JOB_KEY = "jobset.sigs.k8s.io/job-key"
LABEL_JOBSET_REPLICAS = "jobset.sigs.k8s.io/replicatedjob-replicas"
ANN_JOBSET_EXCLUSIVE = "alpha.jobset.sigs.k8s.io/exclusive-topology"
# LeaderWorkerSet (leaderworkerset.x-k8s.io): one group = a leader and size-1 workers.
LABEL_LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LABEL_LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
ANN_LWS_SIZE = "leaderworkerset.sigs.k8s.io/size"
ANN_LWS_EXCLUSIVE = "leaderworkerset.sigs.k8s.io/exclusive-topology"
# LWS subgroups (spec.leaderWorkerTemplate.subGroupPolicy): its pod webhook labels each pod
# with its subgroup; the size and the subgroup's exclusive key are annotations.
LABEL_LWS_SUBGROUP_INDEX = "leaderworkerset.sigs.k8s.io/subgroup-index"
ANN_LWS_SUBGROUP_SIZE = "leaderworkerset.sigs.k8s.io/subgroup-size"
ANN_LWS_SUBGROUP_EXCLUSIVE = "leaderworkerset.sigs.k8s.io/subgroup-exclusive-topology"
ANN_LWS_SUBGROUP_POLICY = "leaderworkerset.sigs.k8s.io/subgroup-policy-type"
LWS_LEADER_EXCLUDED = "LeaderExcluded"
# Kubeflow training-operator (kubeflow.org/v1 PyTorchJob, TFJob, MPIJob): on every pod, with
# a controller ownerReference to the job object.
LABEL_TRAINING_JOB_NAME = "training.kubeflow.org/job-name"
LABEL_TRAINING_REPLICA_TYPE = "training.kubeflow.org/replica-type"
# KubeRay (ray.io/v1 RayCluster).
LABEL_RAY_CLUSTER = "ray.io/cluster"
# Kueue: plain pod groups, and the LocalQueue a workload is submitted to.
LABEL_KUEUE_POD_GROUP = "kueue.x-k8s.io/pod-group-name"
ANN_KUEUE_POD_GROUP_TOTAL = "kueue.x-k8s.io/pod-group-total-count"
LABEL_KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
# Kueue's namespace default: a LocalQueue of this name takes the workloads with no queue label.
KUEUE_DEFAULT_LOCAL_QUEUE = "default"
KUEUE_ADMITTED = "Admitted"
# The upstream Workload API (scheduling.k8s.io/v1alpha2, Kubernetes 1.36, feature gate
# GenericWorkload): a pod names its PodGroup in spec.schedulingGroup.podGroupName.

# Owner kinds (the index keys objects by these; their entries are in kinds.KINDS).
JOB = "Job"
JOBSET = "JobSet"
LWS = "LeaderWorkerSet"
PYTORCHJOB = "PyTorchJob"
TFJOB = "TFJob"
MPIJOB = "MPIJob"
JAXJOB = "JAXJob"
TRAINJOB = "TrainJob"
RAYCLUSTER = "RayCluster"
KUEUE_WORKLOAD = "Workload"
LOCALQUEUE = "LocalQueue"
RESOURCEFLAVOR = "ResourceFlavor"
K8S_PODGROUP = "PodGroup.scheduling.k8s.io"
NAMESPACE = "Namespace"
# Controllers whose pods are not gangs: no gang and nothing to say.
NOT_GANGS = frozenset({"ReplicaSet", "StatefulSet", "DaemonSet", "Node", "ReplicationController"})

# A pod whose owner object is not (yet) in the cache waits this long for it, then runs alone.
OWNER_GRACE_S = 30.0
