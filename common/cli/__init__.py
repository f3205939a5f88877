"""Command-line flags that both services' commands share (engine arguments, CURVE keys, flag types)."""
