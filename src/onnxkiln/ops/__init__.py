"""Op semantics shared by every provider: what an op does, written once over an array
backend that each provider supplies (numpy arrays on the host, torch tensors on a device)."""
