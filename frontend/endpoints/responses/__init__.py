"""POST /v1/responses: a Responses body translated into a chat request, answered as Responses items."""
