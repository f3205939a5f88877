"""The engine link: the clients that talk to an engine core in this process or over ZeroMQ (core_client.py,
core_client_mp.py), the client's protocol state machine (core_protocol.py), the core's process
(core_process.py) and the one door into engine_core (engine_seam.py)."""
