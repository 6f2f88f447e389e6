"""The labs' own modules, one package per lab (lab1 .. lab4). A lab may import core, running and an earlier lab."""
