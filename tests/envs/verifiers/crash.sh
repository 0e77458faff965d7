#!/bin/sh
# A verifier that crashes: reads one request and exits with status 3.
read -r line
exit 3
