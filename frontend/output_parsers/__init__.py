"""Reading a model's text as it streams: reasoning sections (reasoning.py) and tool calls (tool_calls/), both
built on the streamed-text helpers of text_stream.py."""
