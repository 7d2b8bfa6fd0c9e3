"""The HTTP layer of every gpufeed service (`gpufeed agent`, `gpufeed fleet`, `gpufeed
scheduler`): their web flags and listen address (`flags`), the accept loop with its
connection cap and timeouts (`listener`, `connections`), TLS and basic auth from an
exporter-toolkit web config file (`webconfig`, `tlsreload`, `auth`), and response hygiene
(`headers`, `compression`). `serve.serve` is the one entry point. It lives below the three
services and imports none of them (tests/test_layering.py).
"""
