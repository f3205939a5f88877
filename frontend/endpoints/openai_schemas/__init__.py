"""The pydantic body models several endpoints build on: strict body types, messages, tool definitions,
sampling and constraint fields, errors and usage. Each endpoint's own request and answer models are in its
`schemas.py`."""
