"""See the search: one offline HTML page of each problem's thought tree and the engine's work.

`seed-tot view RUN_DIR ... --output PAGE.html` (and `seed-tot solve ... --view`) call
`seed_tot.view.page.write_page`. What the engine spent on each node is recorded by the search
(`seed_tot.search.node_work`, a record's "node_work"); the page only reads it: the search never
imports the viewer.
"""
