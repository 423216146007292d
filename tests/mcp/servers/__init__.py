"""Scriptable hostile MCP servers the tests start as real subprocesses."""
