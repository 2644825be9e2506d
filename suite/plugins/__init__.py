"""What a method or workload author builds on: the registry, method-owned options and
the Method contract. Plugins import from ``suite.api``, not from here."""
