# The package's major version is the lease API's (egressproxies.lease.v1):
# 1.x speaks v1. tests/test_packaging.py holds it to proto/ and to the Node
# client's version.
__version__ = "1.0.0"
API_VERSION = "v1"
