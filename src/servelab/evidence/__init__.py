"""The evidence bundle: manifest, checksums, provenance, schemas, verify and release."""
