"""Test-wide set-up.

pyinfra's CLI package gevent-patches the standard library when it is imported, as it is first
thing in every pyinfra run. Tests import it (inventory loading) among others; patched after `ssl`
was imported, every later HTTPS request in the process recurses forever. Imported here, first, the
test process is patched the way a pyinfra run is.
"""

import pyinfra_cli  # noqa: F401
