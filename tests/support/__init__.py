"""What the tests share: real gloo ranks in-process (:mod:`.distributed`), small models and
run contexts (:mod:`.helpers`), a single-process PruneX (:mod:`.prunex_reference`), the
`bench` command in a subprocess or in-process (:mod:`.runs`), and the netemu probe."""
