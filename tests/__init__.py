"""psdp's test suite, a package: tests import their helpers (``tests.oracle``, ``tests.batch_checks``)
and hand pod targets to `psdp.tools.pod.run_pod` as functions (``tests.pod_targets...``)."""
