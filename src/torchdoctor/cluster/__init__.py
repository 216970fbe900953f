"""A job of many ranks as one patient: each rank publishes its endpoint in the job's own
c10d store, and the ranks' endpoints are reached from any rank (over Unix sockets on the same
node, over token-protected TCP across nodes) to compare them.

Used by the rank (publishing, gathering the others for the job-level diagnoses) and by the
CLI's `cluster` verb; it imports neither probe/ nor cli/.
"""
