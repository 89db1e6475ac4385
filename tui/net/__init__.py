"""HTTP: the one network policy (proxies, credentials), the keep-alive client, listen addresses."""
