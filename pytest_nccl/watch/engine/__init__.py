"""The controller side of the watch, one per node: it follows the ranks' files (``monitor``), judges
them with the one driver (``jobview``: its transport), talks to the other nodes' watches
(``channel``, ``nodes``, ``acrossnodes``), ends the job (``control``), and tells a front-end what it
found (``job.Engine``, ``job.FrontEnd``)."""
