"""Test tooling that ships with the package: `ramgrid.testing.jepsen`, histories checked for linearizability."""
