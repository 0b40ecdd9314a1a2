"""Shipped routing profiles (data) and their JSON schema; see README.md in this folder."""
