"""The answers room: everything that turns model outputs into the record that goes out, for both protocols.

- :mod:`consumer.answers.ladder`: the too-large ladder (sent alone, then shrunk).
"""
