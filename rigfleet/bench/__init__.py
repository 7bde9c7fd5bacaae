"""``rigfleet bench``, the control side of ``rigfleet.hostside.bench`` (which measures and
reports, stdlib only, so a host's gate measures what this measures).
"""
