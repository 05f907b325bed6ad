"""The consumer's wing: the read options (:mod:`.options`), the reading's state machines
(:mod:`.reader_state`, :mod:`.coordinated_reader_state`) and the view of the workers on this
host (:mod:`.local_tasks`). Its threads are :mod:`convoy.data.service._client_reader`; the
dataset op and ``distribute`` are :mod:`convoy.data.service._distribute`."""
