"""The engine core process: its sockets and frontend sessions, and the step loop it drives.

- core_proc.py: EngineCoreProc: the IO thread (frames in and out, per-frontend sessions) and the busy loop.
- core.py: EngineCore: schedule -> execute -> update, one step at a time.
- frontend_sessions.py: which frontend owns which request, and when a silent one is let go.
- stats_log.py: the throughput line the core logs while it serves.
"""
