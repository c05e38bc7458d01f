"""The HTTP side: the server, TLS and basic auth (the web config), connection limits, and the pages it serves."""
