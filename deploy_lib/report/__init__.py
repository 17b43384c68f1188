"""`invoke report`, the pure part: a host's tables collected from its history and written as one
HTML page with CSV and JSON beside it. The read of the host is deploy_lib/host/report.py.

    data    the host's tables, collected from history
    sweep   a tuning sweep's tables, collected from history
    charts  matplotlib figures as inline SVG (matplotlib loads only here)
    page    the HTML page (Jinja2), the CSV files and the JSON document, written
"""
