"""The HTTP serving layer shared by every HTTP endpoint gpufeed runs: connection limits,
the accept loop, TLS and basic auth from a web config file, and response hygiene."""
