"""The data layer every run reads through: the workload contract (:mod:`.workload`: model
builder, dataset, recipe), the datasets in memory (:mod:`.datasets`: Fashion-MNIST, CIFAR-10,
synthetic), each rank's shard and batches (:mod:`.sharding`) and the lr schedule over the
samples a rank consumes (:mod:`.schedule`). Workloads themselves are plugins
(``workloads/`` holds the built-in ones); they import the contract from :mod:`suite.api`."""
