"""The ranks as a cluster: topology and process groups, how ranks come up, the
instrumented communicator and recorder, emulated inter-node links."""
