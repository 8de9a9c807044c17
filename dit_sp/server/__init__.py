"""HTTP servers over the library, on aiohttp: the reward server (``rewards.RewardServer``), the video server
(``videos.VideoServer``: OpenAI's Videos API over sequence-parallel workers, with ``jobs``, ``scheduler``,
``workers``, ``video_request`` and ``page``), and the limits they hold their clients to (``limits``)."""
