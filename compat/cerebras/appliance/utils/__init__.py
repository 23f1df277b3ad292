"""Utilities of ``cerebras.appliance`` used by the Model Zoo and user scripts."""
