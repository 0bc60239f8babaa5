"""Delivery: sending what the pipeline makes to people — the weekly report by e-mail and Slack, alert
notifications to their sinks."""
