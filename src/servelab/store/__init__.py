"""What a run keeps, and how it is read back: the results folder's layout (paths), the typed
launch, point and run records (records), one request's record (request), the raw data read as
a whole (rawdata), JSON written the same bytes every time (jsonio) and content digests
(hashing). Imports nothing above the design of a sweep (servelab.design)."""
