"""The design of a sweep, below everything that measures or analyses one: a point's level,
rate or concurrency (level), the balanced orders of its repeats (schedule) and when an open
loop sends each request (arrivals)."""
