"""The coordinator: the only role that converses with the human (dispatch and announcements come
with the org issue; for now it starts, heartbeats, reconciles and answers ping)."""
