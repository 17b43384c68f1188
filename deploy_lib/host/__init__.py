"""Host actions: what reads or changes one host through a Remote, one module per concern (the
facts read, the store and its lock, the switch and its restore, the readiness ladder, venvs,
weights, the benchmark, the report's read), plus the project's hook executables run here.
The steps and the decisions are planning's (the concern packages); here they are sent."""
