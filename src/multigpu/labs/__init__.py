"""The labs' own modules, one package per lab (lab1 .. lab5). A lab may import core, running and an earlier lab."""
