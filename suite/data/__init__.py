"""The data layer every run reads through: the workload contract (``workload``: model
builder, dataset, recipe), the datasets in memory (``datasets``: Fashion-MNIST, CIFAR-10,
synthetic), each rank's shard and batches (``sharding``) and the lr schedule over the
samples a rank consumes (``schedule``). Workloads themselves are plugins
(``workloads/`` holds the built-in ones); they import the contract from ``suite.api``."""
