"""The model relay: how a sandboxed command reaches a model endpoint, and the meter that counts it.
"""
