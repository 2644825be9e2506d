"""The regression gate, above the run-folder format: comparing result sets, each method's
activity check, change points over the nightly history, and the reference policy."""
