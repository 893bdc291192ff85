"""Training gangs: planning a whole gang at once (pure), the reservation book that holds its
members' places, and the gang verbs that steer members to their planned nodes.
"""
