#!/bin/sh
# A verifier that prints garbage: answers every request with a non-JSON line.
while read -r line; do
  echo "<html>not json</html>"
done
