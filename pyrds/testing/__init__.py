"""Test support for pyrds: the pytest plugin (backend fixtures), socket agents, two-node topologies,
report."""
