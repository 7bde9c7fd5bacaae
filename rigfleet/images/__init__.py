"""The fleet's pinned images on the hosts (their sources: ``rigfleet.image_sources``):
``hoststate`` (what a host holds), ``plan`` (the staging decision, pure), ``checks`` (the
control-side source checks), ``deploy`` (preflight and role), ``archive`` and ``transfer``
(saved copies), ``cli`` (``rigfleet images``: status, export, import). See docs/images.md.
"""
