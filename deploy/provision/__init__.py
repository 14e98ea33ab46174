"""Provisioning of the benchmark host with boto3.

``plan`` builds every request payload as plain data (pure functions, no
boto3); ``aws`` checks credentials and makes clients; ``discover`` resolves
the AMI, the instance types of a family and the hourly price; ``launch``,
``remote`` and ``teardown`` make the calls. Nothing here runs at import.
"""
