"""What an analysis becomes for people and tools: the report (text, JSON, Markdown), the HTML
page, the Perfetto export, and the CI gate's comparison of two reports with its output formats.

Takes an Analysis or a report document; loads nothing itself (diag.api does). Imports
diag.engine and below.
"""
