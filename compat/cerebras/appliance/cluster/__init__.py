"""Cluster-side objects of ``cerebras.appliance``, modelled locally (no cluster is contacted)."""
