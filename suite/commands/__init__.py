"""What the ``bench`` commands do before any rank starts: preflight checks, executing
a run or sweep, experiment files and listings."""
