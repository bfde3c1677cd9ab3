"""The runtime core: places, tasks, finish, transport, heartbeats, serialization.

It knows nothing of malleability, which builds on it (``apgas._malleability``).
"""
