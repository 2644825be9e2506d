"""The calibrated simulator: methods' real communication schedules through alpha-beta models.

``costmodel`` prices one collective on a link class, ``profile`` holds a machine's measured or
published numbers, ``replay`` runs a method's own step code with a communicator that prices
collectives instead of issuing them, and writes ordinary (simulated) run folders.
"""
