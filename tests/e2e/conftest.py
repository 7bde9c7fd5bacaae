"""The session fixtures of the end-to-end tests. The fleet and its helpers live in
``e2e_fleet``, a module name of their own: tests/hosts has a conftest too, and a test's
``from conftest import ...`` would find that one when both folders are collected in one run."""

from e2e_fleet import converged, testbed  # noqa: F401  (pytest takes fixtures from here)
