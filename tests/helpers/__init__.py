"""What the tests share: clients, processes and servers, as plain classes and functions;
the fixtures are in tests/conftest.py."""
